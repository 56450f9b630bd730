"""Imported by transformers' fast image processors, which the scripts never call on images: nothing here."""
