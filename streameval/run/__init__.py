"""Layer 4: one run: settings, the session, the one pipeline (passes -> state -> result),
``evaluate``, incremental ``update`` and saved states."""
