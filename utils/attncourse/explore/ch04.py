"""Chapter 04's explorers (see attncourse.explore)."""
__all__ = []
