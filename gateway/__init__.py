"""The gateway: the fleet's front door. Same /ocr API as a worker; splits PDFs into pages, fans
them out to replicas, retries failed pages elsewhere and reassembles them in order. Imports no
OCR engine."""
