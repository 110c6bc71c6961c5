"""The commands a user runs from their shell besides the run itself: `rljob status`, `rljob export`."""
