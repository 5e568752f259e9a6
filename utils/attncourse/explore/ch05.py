"""Chapter 05's explorers (see attncourse.explore)."""
__all__ = []
