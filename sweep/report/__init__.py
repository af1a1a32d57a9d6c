"""What a person reads about a run: the analysis, the text, HTML and PNG views."""
