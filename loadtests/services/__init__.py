"""The real example services before and after a change: ``python -m loadtests.services --base REV`` (``bench``).
The two checkouts (``_checkouts``) and the loads with their correctness guard (``_load``)."""
