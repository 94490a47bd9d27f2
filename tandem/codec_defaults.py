"""The codec's defaults, in a module without numpy or torch, so configuration schemas (and with
them the CLIs' --help) can name them without loading torch."""

DEFAULT_MAX_ENTRIES = 16
DEFAULT_SCALE = 1023  # weights are integers in [1, scale]; 10 bits of resolution per entry
DEFAULT_CODED_ENTRIES = 24  # most entries of an entropy-coded q (tandem/qcodec.py: its CAP)
