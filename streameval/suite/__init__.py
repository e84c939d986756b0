"""Feature-variant suites (docs/suites.md): plans of (query variant, gallery variant) evaluations, run grouped by gallery variant."""
