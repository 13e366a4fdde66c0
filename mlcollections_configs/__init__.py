"""One `get_config(arg)` file per study; see each file's docstring for its run command."""
