"""Real parts for tests: servers, files and shapes built the way the product meets them."""
