"""Prefect flows: they order stages and choose where they run; the work lives in tasks/ and components/."""
