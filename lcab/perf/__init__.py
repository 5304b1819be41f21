"""Speed figures of lcab's own code (``python -m lcab.perf <topic>``); printed, never asserted."""
