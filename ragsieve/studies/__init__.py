"""The studies behind ``results/``: one module per ``experiments/*.yaml``, plus the demo.

Studies sit above the library: they may import any stage, and no library module imports
them. ``common`` holds what they share (progress bars, tables, plots, atomic JSON).
"""
