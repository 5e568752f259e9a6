"""Chapter 03's explorers (see attncourse.explore)."""
__all__ = []
