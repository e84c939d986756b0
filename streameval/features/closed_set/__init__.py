"""The closed-set metrics every run computes (docs/metrics.md): ranking slots, CMC, AP, INP, per
trial."""
