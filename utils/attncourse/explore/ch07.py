"""Chapter 07's explorers (see attncourse.explore)."""
__all__ = []
