"""Deployment files: Dockerfiles (deploy/docker) and Kubernetes manifests (deploy/k8s)."""
