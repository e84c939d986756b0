"""Layer 0: what every other layer uses: errors, option vocabularies and ranges, progress, output
paths, locks, signals, rates and spreads.  Imports nothing of streameval above it."""
