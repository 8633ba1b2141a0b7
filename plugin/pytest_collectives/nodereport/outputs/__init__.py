"""The node report's outputs: report.json (its schema), HTML, JUnit, Markdown and the plots."""
