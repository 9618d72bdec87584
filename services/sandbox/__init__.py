"""Sandbox service: python, web_search and crawl_page tools, each call isolated and limited."""
