"""Store makers: ``synth`` (synthetic problems) and ``convert`` (the files users have -> a store)."""
