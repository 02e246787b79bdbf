"""better-compute: book GPU capacity now, later, as gangs or as spot."""
