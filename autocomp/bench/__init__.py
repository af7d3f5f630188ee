"""Benchmarks: compressors (this machine's compute cost per compressor) and, later, link
(end-to-end over a shaped link)."""
