"""Dispatch control function: routing, cold-start coalescing, scale-up."""
