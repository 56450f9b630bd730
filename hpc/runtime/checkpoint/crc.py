"""CRC-32 (zlib's polynomial and values): ISA-L's runs several times faster than zlib's, which on a GPU
node is slower than the disk and would set the pace of every save. zlib's serves where ISA-L is missing."""

try:
    from isal.isal_zlib import crc32
except ImportError:  # pragma: no cover - isal is a dependency; kept for odd platforms without its wheels
    from zlib import crc32

__all__ = ["crc32"]
