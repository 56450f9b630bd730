"""Imported by transformers' fast image processors; the scripts only read those processors' size, mean and std."""
