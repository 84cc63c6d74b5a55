"""The console's read models (the writes go through the domain functions the API uses)."""
