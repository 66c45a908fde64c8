"""How findings are shown: terminal (rich) and JSON; the HTML run report lives here too."""
