RESULTS = f"results/{config['name']}"


def as_args(values):
    """A config list as space-separated command-line arguments."""
    return " ".join(str(value) for value in values)
