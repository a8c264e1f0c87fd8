"""Studies: every topology of a recipe launched, swept, stopped and reported, unattended."""
