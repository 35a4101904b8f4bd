"""The embedding port and its adapters."""
