"""Schedule control function: placement on the instance's node partition."""
