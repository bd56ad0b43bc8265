"""HTTP edge: authenticates clients, publishes their requests and streams replies back."""
