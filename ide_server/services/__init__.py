"""Services: the queries and rules behind the routes. They take a DB session and raise `errors.*`."""
