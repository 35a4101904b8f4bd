"""Storage ports and the PostgreSQL adapter that implements them."""
