"""What a person reads about a run: one analysis, and the text, HTML and PNG views of it.
Each module imports only those below it, so that no view depends on another's insides:
numbers, errors, timeline, ranking < analysis < rates < text, plots, page_data < html <
command. A sweep over problems is reported a problem at a time (ranking.Problem)."""
