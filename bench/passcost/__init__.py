"""`tandem pass-cost`: a target's verify-pass time surface (cli.py has the picture)."""
