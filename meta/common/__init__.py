"""What every level imports: components and their options, files, threads, the user-code boundary,
and the aliases that keep moved modules importable for one release."""
