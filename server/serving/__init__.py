"""The serving layer: one class per endpoint on a shared base (`base.py`); routes stay thin."""
