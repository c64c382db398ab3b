"""The dashboard's pages, one module per concept, each with its own router
(``/dashboard`` prefixed, from :func:`service.dashboard.common.page_router`);
:mod:`service.dashboard.routes` includes them all, in one router."""
