"""Nasdaq TotalView-ITCH 5.0: the wire layout, a writer, readers and a session generator.

Installed with the `duetime[itch]` extra (numba speeds up the whole-file fast path but is
optional). The modules are imported one by one (`duetime.feeds.itch.parser`, `.writer`, …) so
that writing a file never pays for importing numba.
"""
