// A small Iceberg REST catalog server for tests: the JDK's HttpServer in front of the request handlers
// Iceberg's own runtime jar ships (CatalogHandlers, the REST request/response classes and their JSON
// mapper), over a JdbcCatalog in PostgreSQL with HadoopFileIO (local folders or s3:// through S3A).
// This is what Iceberg's own REST test fixture does (RESTCatalogAdapter); it is a test fixture, not
// part of headrace. In package org.apache.iceberg.rest for RESTObjectMapper.mapper(), package-private.
//
// Arguments: key=value pairs. port=N (0: any; the chosen port is printed as "listening on N"),
// token=T (every request but /v1/oauth/tokens must send "Authorization: Bearer T"),
// client=ID:SECRET (OAuth2 client credentials exchanged for the token at /v1/oauth/tokens), keys
// starting with "fs." go to the Hadoop configuration, every other key is a JdbcCatalog property
// (uri, jdbc.user, jdbc.password, warehouse, ...).
//
// Multi-table commits (POST /v1/transactions/commit): Iceberg 1.9.2's CatalogHandlers has no handler for
// them, so commitTransaction below applies every table's requirements and updates first, then commits
// them one table after another, as Iceberg's own fixture does. A JdbcCatalog has no transaction across
// tables, so to make the commit atomic for this server's readers it holds a write lock that every table
// load waits for: a load sees all of a multi-table commit or none of it (what a catalog with a
// multi-table transaction, Polaris, Nessie, gives by its store).
//
// Failures on demand: POST /v1/test/fail-transactions?statuses=S1,S2,... makes the next multi-table
// commits fail one status each, in order, committing nothing: 409 as a refused requirement
// (CommitFailedException, what a conflicting commit to one of the tables gives), any other as that
// HTTP error (500: the client cannot tell whether the commit happened).
package org.apache.iceberg.rest;

import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.Executors;
import java.util.concurrent.ConcurrentLinkedQueue;
import java.util.concurrent.locks.ReadWriteLock;
import java.util.concurrent.locks.ReentrantReadWriteLock;
import org.apache.hadoop.conf.Configuration;
import org.apache.iceberg.BaseTable;
import org.apache.iceberg.BaseTransaction;
import org.apache.iceberg.Table;
import org.apache.iceberg.Transaction;
import org.apache.iceberg.Transactions;
import org.apache.iceberg.catalog.Namespace;
import org.apache.iceberg.catalog.TableIdentifier;
import org.apache.iceberg.exceptions.AlreadyExistsException;
import org.apache.iceberg.exceptions.CommitFailedException;
import org.apache.iceberg.exceptions.NamespaceNotEmptyException;
import org.apache.iceberg.exceptions.NoSuchNamespaceException;
import org.apache.iceberg.exceptions.NoSuchTableException;
import org.apache.iceberg.exceptions.NotFoundException;
import org.apache.iceberg.exceptions.ValidationException;
import org.apache.iceberg.jdbc.JdbcCatalog;
import org.apache.iceberg.rest.requests.CommitTransactionRequest;
import org.apache.iceberg.rest.requests.CreateNamespaceRequest;
import org.apache.iceberg.rest.requests.CreateTableRequest;
import org.apache.iceberg.rest.requests.RegisterTableRequest;
import org.apache.iceberg.rest.requests.RenameTableRequest;
import org.apache.iceberg.rest.requests.UpdateNamespacePropertiesRequest;
import org.apache.iceberg.rest.requests.UpdateTableRequest;
import org.apache.iceberg.rest.responses.ConfigResponse;
import org.apache.iceberg.rest.responses.ErrorResponse;
import org.apache.iceberg.rest.responses.OAuthTokenResponse;
import org.apache.iceberg.shaded.com.fasterxml.jackson.databind.ObjectMapper;

public class RestCatalogServer {
  private static final ObjectMapper MAPPER = RESTObjectMapper.mapper();
  private final JdbcCatalog catalog = new JdbcCatalog();
  private String token;
  private String client;
  private final ReadWriteLock commits = new ReentrantReadWriteLock(); // see commitTransaction
  private final ConcurrentLinkedQueue<Integer> failTransactions = new ConcurrentLinkedQueue<>(); // see the header

  public static void main(String[] args) throws Exception {
    new RestCatalogServer().start(args);
  }

  private void start(String[] args) throws IOException {
    Map<String, String> props = new HashMap<>();
    Configuration hadoop = new Configuration();
    int port = 0;
    for (String arg : args) {
      String key = arg.substring(0, arg.indexOf('='));
      String value = arg.substring(arg.indexOf('=') + 1);
      if (key.equals("port")) port = Integer.parseInt(value);
      else if (key.equals("token")) token = value;
      else if (key.equals("client")) client = value;
      else if (key.startsWith("fs.")) hadoop.set(key, value);
      else props.put(key, value);
    }
    catalog.setConf(hadoop);
    catalog.initialize("rest_backend", props);
    HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 64);
    server.createContext("/", this::handle);
    server.setExecutor(Executors.newFixedThreadPool(8));
    server.start();
    System.out.println("listening on " + server.getAddress().getPort());
    System.out.flush();
  }

  private void handle(HttpExchange exchange) throws IOException {
    try {
      String method = exchange.getRequestMethod();
      String[] parts = exchange.getRequestURI().getRawPath().replaceAll("^/+|/+$", "").split("/");
      String body = new String(exchange.getRequestBody().readAllBytes(), StandardCharsets.UTF_8);
      if (parts.length == 3 && parts[1].equals("oauth") && parts[2].equals("tokens")) {
        Map<String, String> form = RESTUtil.decodeFormData(body);
        String given = form.get("client_id") + ":" + form.get("client_secret");
        if (client == null || !client.equals(given)) {
          error(exchange, 401, "NotAuthorizedException", "invalid client credentials");
          return;
        }
        respond(exchange, 200, OAuthTokenResponse.builder().withToken(token).withTokenType("bearer")
            .withIssuedTokenType("urn:ietf:params:oauth:token-type:access_token").build());
        return;
      }
      String auth = exchange.getRequestHeaders().getFirst("Authorization");
      if (token != null && !("Bearer " + token).equals(auth)) {
        error(exchange, 401, "NotAuthorizedException", "Not authorized: a valid bearer token is required");
        return;
      }
      if (parts.length == 2 && parts[1].equals("config")) {
        respond(exchange, 200, ConfigResponse.builder().build());
        return;
      }
      route(exchange, method, parts, body);
    } catch (NoSuchNamespaceException | NoSuchTableException | NotFoundException e) {
      error(exchange, 404, e.getClass().getSimpleName(), e.getMessage());
    } catch (AlreadyExistsException | CommitFailedException | NamespaceNotEmptyException e) {
      error(exchange, 409, e.getClass().getSimpleName(), e.getMessage());
    } catch (ValidationException | IllegalArgumentException e) {
      error(exchange, 400, e.getClass().getSimpleName(), e.getMessage());
    } catch (RuntimeException e) {
      e.printStackTrace();
      error(exchange, 500, e.getClass().getSimpleName(), String.valueOf(e.getMessage()));
    }
  }

  private void route(HttpExchange ex, String method, String[] p, String body) throws IOException {
    // p[0] is "v1"
    if (p.length == 2 && p[1].equals("namespaces")) {
      if (method.equals("GET")) {
        String parent = query(ex, "parent");
        Namespace ns = parent == null ? Namespace.empty() : RESTUtil.decodeNamespace(parent);
        respond(ex, 200, CatalogHandlers.listNamespaces(catalog, ns));
      } else {
        respond(ex, 200, CatalogHandlers.createNamespace(catalog, MAPPER.readValue(body, CreateNamespaceRequest.class)));
      }
      return;
    }
    if (p.length == 3 && p[1].equals("test") && p[2].equals("fail-transactions") && method.equals("POST")) {
      for (String status : query(ex, "statuses").split(",")) failTransactions.add(Integer.parseInt(status));
      respond(ex, 204, null);
      return;
    }
    Integer failStatus = null;
    if (p.length == 3 && p[1].equals("transactions") && p[2].equals("commit") && method.equals("POST")
        && (failStatus = failTransactions.poll()) != null) {
      if (failStatus == 409) {
        throw new CommitFailedException("Requirement failed: refused by the test server (a conflicting commit)");
      }
      error(ex, failStatus, "ServiceFailureException", "the test server failed this commit (" + failStatus + ")");
      return;
    }
    if (p.length == 3 && p[1].equals("transactions") && p[2].equals("commit") && method.equals("POST")) {
      commitTransaction(MAPPER.readValue(body, CommitTransactionRequest.class));
      respond(ex, 204, null);
      return;
    }
    if (p.length == 3 && p[1].equals("tables") && p[2].equals("rename")) {
      CatalogHandlers.renameTable(catalog, MAPPER.readValue(body, RenameTableRequest.class));
      respond(ex, 204, null);
      return;
    }
    if (p.length < 3 || !p[1].equals("namespaces")) {
      error(ex, 404, "NotFoundException", "no route for " + method + " " + ex.getRequestURI());
      return;
    }
    Namespace ns = RESTUtil.decodeNamespace(URLDecoder.decode(p[2], StandardCharsets.UTF_8));
    if (p.length == 3) {
      switch (method) {
        case "GET": respond(ex, 200, CatalogHandlers.loadNamespace(catalog, ns)); return;
        case "HEAD": CatalogHandlers.namespaceExists(catalog, ns); respond(ex, 204, null); return;
        case "DELETE": CatalogHandlers.dropNamespace(catalog, ns); respond(ex, 204, null); return;
        default: break;
      }
    } else if (p.length == 4 && p[3].equals("properties")) {
      respond(ex, 200, CatalogHandlers.updateNamespaceProperties(catalog, ns,
          MAPPER.readValue(body, UpdateNamespacePropertiesRequest.class)));
      return;
    } else if (p.length == 4 && p[3].equals("register")) {
      respond(ex, 200, CatalogHandlers.registerTable(catalog, ns, MAPPER.readValue(body, RegisterTableRequest.class)));
      return;
    } else if (p.length == 4 && p[3].equals("tables")) {
      if (method.equals("GET")) {
        respond(ex, 200, CatalogHandlers.listTables(catalog, ns));
      } else {
        CreateTableRequest request = MAPPER.readValue(body, CreateTableRequest.class);
        respond(ex, 200, request.stageCreate() ? CatalogHandlers.stageTableCreate(catalog, ns, request)
            : CatalogHandlers.createTable(catalog, ns, request));
      }
      return;
    } else if (p.length >= 5 && p[3].equals("tables")) {
      TableIdentifier id = TableIdentifier.of(ns, URLDecoder.decode(p[4], StandardCharsets.UTF_8));
      if (p.length == 6 && p[5].equals("metrics")) {
        respond(ex, 204, null);
        return;
      }
      switch (method) {
        case "GET":
          commits.readLock().lock();
          try {
            respond(ex, 200, CatalogHandlers.loadTable(catalog, id));
          } finally {
            commits.readLock().unlock();
          }
          return;
        case "HEAD": CatalogHandlers.tableExists(catalog, id); respond(ex, 204, null); return;
        case "POST":
          respond(ex, 200, CatalogHandlers.updateTable(catalog, id, MAPPER.readValue(body, UpdateTableRequest.class)));
          return;
        case "DELETE":
          if ("true".equals(query(ex, "purgeRequested"))) CatalogHandlers.purgeTable(catalog, id);
          else CatalogHandlers.dropTable(catalog, id);
          respond(ex, 204, null);
          return;
        default: break;
      }
    }
    error(ex, 404, "NotFoundException", "no route for " + method + " " + ex.getRequestURI());
  }

  // Every table's requirements checked and updates applied (in memory) before any table commits; then
  // the commits, under the write lock (see the header).
  private void commitTransaction(CommitTransactionRequest request) {
    commits.writeLock().lock();
    try {
      List<Transaction> staged = new ArrayList<>();
      for (UpdateTableRequest change : request.tableChanges()) {
        Table table = catalog.loadTable(change.identifier());
        Transaction transaction =
            Transactions.newTransaction(change.identifier().toString(), ((BaseTable) table).operations());
        CatalogHandlers.commit(((BaseTransaction.TransactionTable) transaction.table()).operations(), change);
        staged.add(transaction);
      }
      staged.forEach(Transaction::commitTransaction);
    } finally {
      commits.writeLock().unlock();
    }
  }

  private static String query(HttpExchange ex, String name) {
    String raw = ex.getRequestURI().getRawQuery();
    if (raw == null) return null;
    for (String pair : raw.split("&")) {
      int eq = pair.indexOf('=');
      if (eq > 0 && pair.substring(0, eq).equals(name)) {
        return URLDecoder.decode(pair.substring(eq + 1), StandardCharsets.UTF_8);
      }
    }
    return null;
  }

  private static void error(HttpExchange ex, int code, String type, String message) throws IOException {
    respond(ex, code, ErrorResponse.builder().responseCode(code).withType(type).withMessage(message).build());
  }

  private static void respond(HttpExchange ex, int code, Object value) throws IOException {
    if (value == null) {
      ex.sendResponseHeaders(code, -1);
      ex.close();
      return;
    }
    byte[] out = MAPPER.writeValueAsBytes(value);
    ex.getResponseHeaders().add("Content-Type", "application/json");
    ex.sendResponseHeaders(code, out.length);
    try (OutputStream os = ex.getResponseBody()) {
      os.write(out);
    }
  }
}
