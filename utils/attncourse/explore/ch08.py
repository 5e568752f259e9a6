"""Chapter 08's explorers (see attncourse.explore)."""
__all__ = []
