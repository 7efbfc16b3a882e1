"""The ground floor: the verdict's vocabulary (statuses, flags, results) and the typed errors.

Everything else in cudal1 may import from here; nothing here imports anything above it.
"""
