#!/usr/bin/env python3
"""Writes the zstd-decompressed concatenation of the given files to stdout (the machine may have
no zstd program; the ``zstandard`` wheel travels with the parts). Used by run_on_gpu.sh."""

import sys

import zstandard

reader_files = [open(p, "rb") for p in sys.argv[1:]]


class Cat:
    def __init__(self, files):
        self.files = files

    def read(self, n=-1):
        while self.files:
            chunk = self.files[0].read(n)
            if chunk:
                return chunk
            self.files.pop(0)
        return b""


dctx = zstandard.ZstdDecompressor(max_window_size=1 << 31)
dctx.copy_stream(Cat(reader_files), sys.stdout.buffer, read_size=1 << 20, write_size=1 << 20)
