"""The algorithms under test and their exact references, as the suites import them."""
