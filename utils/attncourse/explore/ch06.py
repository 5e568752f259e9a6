"""Chapter 06's explorers (see attncourse.explore)."""
__all__ = []
