"""Chapter 01's explorers (see attncourse.explore)."""
__all__ = []
