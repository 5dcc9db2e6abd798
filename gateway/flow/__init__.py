"""Flow control: how many pages are out, and which replica gets the next one."""
