"""Reports: strings made from results. Nothing here traces, counts or prints."""
