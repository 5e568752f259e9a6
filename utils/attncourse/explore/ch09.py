"""Chapter 09's explorers (see attncourse.explore)."""
__all__ = []
