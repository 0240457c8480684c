"""The ground floor: pure decisions, settings and tables. No pyinfra state, no I/O."""
