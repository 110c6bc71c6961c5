"""rljob operator: kopf handlers over pure rendering, status and scaling functions. Never imports torch or ray."""
