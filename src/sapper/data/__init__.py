"""Datasets as training code reads them: token files scanned without loading them."""

from sapper.data.tokens import TokenScan, scan_token_ids

__all__ = ["TokenScan", "scan_token_ids"]
