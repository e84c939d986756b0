"""Layer 6: what users read: the terminal report and pasted tables, aggregates of runs, plots,
ranked-list pages."""
