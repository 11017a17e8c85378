"""Gravity: direct, octree (Barnes-Hut with group interaction lists), PM and TreePM."""
