"""Feature-variant suites (PROTOCOLS.md section 4): plans of (query variant, gallery variant) evaluations, run grouped by gallery variant."""
