"""Market-data feeds for feed handlers built on duetime; the core server never imports them."""
